import sys

from monitoring.server import main

sys.exit(main())
