import sys

from . import _need_torch

try:
    _need_torch()
except ImportError as e:
    print("error: %s" % e, file=sys.stderr)
    sys.exit(2)

from .cli import main  # noqa: E402

sys.exit(main())
