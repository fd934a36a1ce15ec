import sys

from artweb.launcher import main

sys.exit(main())
