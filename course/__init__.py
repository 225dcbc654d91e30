"""The course as data and tools: syllabus, config templates, lab scripts, assignment tooling."""
from course import i18n as _i18n

if _i18n.lang() == "zh":  # a Chinese-edition kernel: every chapter imports course, so its figures draw hanzi
    _i18n.activate()
