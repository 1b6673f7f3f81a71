"""Needs a package that is not part of the training stack (test fixture)."""

import tabulate

print("tabulate", tabulate.__version__, flush=True)
