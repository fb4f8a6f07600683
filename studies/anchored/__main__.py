"""``python -m studies.anchored``: plan and run the anchored-client study's missing runs."""
from studies.anchored import main

raise SystemExit(main())
