"""``python -m ftta_core.anchored``: plan and run the anchored-client study's missing runs."""
from . import main

raise SystemExit(main())
