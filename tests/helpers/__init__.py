"""What the tests share that is not a test: fake and replaying servers, the real recordings turned
into the diagnoser's inputs, a screen's text read back from its SVG. Tests import these, never
each other."""
