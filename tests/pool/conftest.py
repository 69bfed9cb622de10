"""Every pool test leaves no process or program directory behind (the core tests' checks)."""
from tests.core.conftest import no_leftovers, private_tmpdir  # noqa: F401  (fixtures)
