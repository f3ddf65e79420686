"""Code generated from proto/ by `make gen`; do not edit."""
