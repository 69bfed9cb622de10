"""Fixtures for the Reverb tests: the core's leak checks."""
from tests.core.conftest import no_leftovers, private_tmpdir  # pylint: disable=unused-import
