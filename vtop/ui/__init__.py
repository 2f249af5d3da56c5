"""Everything Textual."""
