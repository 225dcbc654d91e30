"""Tests of the chapter notebooks as a student meets them: grading of every release, and JupyterLab in a browser."""
