"""Loaders for the data the pure policies are handed: files in, policy objects out.

The policies (`faas_gpu.policies`) read no files, no package resources and no environment
(DESIGN principle 1, checked by `tests/policies/test_policy_purity.py` and `lint-imports`): whoever drives
them, a daemon, the simulator or a benchmark, loads the data here and passes it in.

- `harmony`: HarmonyBatch's `model.json` (latency coefficients) and `config.json` (platform ranges);
- `protean`: PROTEAN's `assumptions.yaml` (the slowdown model and settings, with measured overlays)
  and `mig_profiles.yaml` (the MIG profile tables), both shipped in this package.
"""
