"""The trusted side: code only trusted jobs run, never a training job.

Everything here runs in GitHub-hosted jobs on the default branch's code (`plan`, `job-identity`,
`attest`, `report`, `promote`, `revoke-identity` in experiment-train.yml and
experiment-promote.yml) or inside the MLflow server (the job-identity check), with
credentials a training job never holds. A training job runs the pull request's code from its
first byte to its last, so nothing it writes is read here unverified: every run, checkpoint or
data version it names is checked against an identity or a digest recorded on this side.

    registry.py       what a launch may reuse, which seeds a claim gets, the trusted verdict
    provenance.py     the attestation: a training job's runs checked against MLflow
    promote.py        promotion on merge: gates re-checked, the registry alias moved
    job_identity.py   per-launch MLflow identities (made here, revoked after training)
    mlflow_oidc.py    the MLflow server's check of a training job's GitHub OIDC token

The training side imports none of this (tests/unit/test_trusted_boundary.py); it reads the
plan's data types from pipelines/launch_plan.py. CODEOWNERS gives this folder its own owners.
"""
