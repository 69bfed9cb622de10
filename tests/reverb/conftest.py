"""Fixtures for the Reverb tests: the node tests' leak check."""
from tests.nodes.conftest import no_leftovers  # pylint: disable=unused-import
