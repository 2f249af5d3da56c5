"""Pure logic: histories, rates, phase tracking, diagnosis. No I/O, no Textual."""
