"""Job scripts as text: quoting, the Jinja2 environment, sbatch and sweep scripts (nothing written)."""
