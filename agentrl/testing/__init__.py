"""Fakes of the external edges only (a scripted engine; later a fake Kubernetes API), shipped for users' tests."""
