"""Reports: the JSON result file (primary artifact) and its renderings."""
