"""The crash-report demo: a Socorro-style pipeline on Cherami (``make demo``)."""
