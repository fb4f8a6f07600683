"""The FTTA engine: client bank backends, mixing kernel, upload checks and the step loop."""
