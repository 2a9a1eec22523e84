"""The command line: ``kvgate`` (main: serve, sim, demo, estimate, check, settings), its entry point that keeps an
early SIGHUP (hangups), and each tool's own module (demo, estimate, check/)."""
