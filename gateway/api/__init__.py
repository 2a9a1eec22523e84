"""kvgate's own HTTP API under /kvgate/: health, fit, count and status."""
