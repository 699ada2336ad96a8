"""What several test modules share: fakes, harnesses, fixtures and the rows they build."""
