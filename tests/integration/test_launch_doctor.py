"""The environment fingerprint: its comparable fields, and a diff that names them."""

from __future__ import annotations

from basics.environment import env_fingerprint, fingerprint_diff, package_version


def test_fingerprint_has_the_comparable_fields_and_diff_names_them():
    fp = env_fingerprint()
    for key in ("python", "torch", "cuda", "accelerate", "transformers", "gpu_model", "hostname", "cpu_model"):
        assert key in fp
    assert fp["torch"] == package_version("torch")
    other = dict(fp, torch="0.0.1", hostname="elsewhere")
    assert fingerprint_diff(fp, other) == [f"torch: {fp['torch']} vs 0.0.1"]
