"""The TABED paper's published block-efficiency tables, as data (README.md)."""
