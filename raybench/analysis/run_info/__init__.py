"""The report's closing sections: the resolved protocol and the run's provenance (versions, hashes). A view."""
