"""``python -m workers.tune --sweep-id ID``: drive one attempt of a service-stored sweep.

The trainable, callbacks and stopper live in importable modules (``workers.tune.*``), not in
``__main__``: cloudpickle would copy ``__main__``'s objects and their globals (the driver's
client) by value into Tune's trial actors.
"""

import sys

from workers.tune.driver import main

sys.exit(main())
