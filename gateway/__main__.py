import sys

from gateway.cli.hangups import main  # before anything else: a SIGHUP during the imports is kept, not fatal

sys.exit(main())
