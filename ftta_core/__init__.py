"""ftta_core: the library behind the ftta federated test-time adaptation workbook."""
__version__ = "0.1.0"
