"""ZeRO Lab's tests, by what they test: zero_ref/, sim/, course/, notebooks/; project-wide checks here."""
