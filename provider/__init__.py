"""OpenFaaS provider and gateway routes for faas-gpu."""
