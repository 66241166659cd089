"""``python -m idem_runtime ...`` runs the ``idem`` binary, as the ``idem`` command does."""

from ._cli import main

main()
