"""`python -m moeplace.cli`: the moeplace command."""

import sys

from . import main

sys.exit(main())
