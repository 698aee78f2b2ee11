"""Offline scenario data that ships with the project (see README.md in this folder)."""
