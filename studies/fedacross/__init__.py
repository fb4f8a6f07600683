"""FedAcross+'s study: accuracy vs k, new-client benefit, costs, t-SNE and the A2 settling comparison (``study``), and
Office-Caltech-10 beside the paper's Office-31 numbers (``office``). The method is ``ftta_core/fedacross/``;
notebook 50 and ``python -m ftta_core study fedacross`` use this package."""
