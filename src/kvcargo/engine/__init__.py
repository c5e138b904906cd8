"""The discrete-event engine (see loop.py); cluster.run() is its entry point."""
