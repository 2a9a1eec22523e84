"""Scripted multi-user workloads against a simulator (workload), their reports (workload_report), and the
straight-versus-gated comparison ``kvgate demo`` runs (demo)."""
