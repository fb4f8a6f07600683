"""One study per paper, on top of the library (``ftta_core``, which imports none of this): its configs per table
cell, its claims with the paper's numbers, its readings, its plans and where its runs are stored. The notebooks import
it; ``python -m ftta_core study PAPER ACTION`` runs its actions (``studies.commands``, registered by entry points).
docs/layout.md lists what is where."""
