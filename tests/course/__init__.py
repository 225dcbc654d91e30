"""Tests of course/: the syllabus, the notebook builder, grading, labs, the site and the Chinese edition."""
