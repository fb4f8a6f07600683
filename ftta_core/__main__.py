"""``python -m ftta_core``."""
import sys

from .cli import main

sys.exit(main())
