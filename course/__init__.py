"""The course as data and tools: syllabus, config templates, lab scripts, assignment tooling."""
