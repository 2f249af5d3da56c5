"""Side effects behind keys (snapshot, py-spy, test request). Never imports Textual."""
