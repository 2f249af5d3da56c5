"""The bottom layer: plain types (the GPU readings) and pure text helpers that the
sources, the core and the faces share. Imports nothing else of vtop."""
