"""Node types: what a program is made of (re-exported from `launchpad`)."""
