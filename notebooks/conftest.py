# The language editions under notebooks/<lang>/ share the English notebooks' code cells and outputs
# (tests/course/test_edition.py checks it), so nbval runs the English ones only.
collect_ignore_glob = ["zh/*"]
