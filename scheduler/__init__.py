"""The global scheduler: LALB-O3 placement of inference jobs on GPU units, with leader election."""
