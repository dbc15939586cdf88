"""Reading a run's outputs: its summary (`summary.py`), plots (`figures.py`), the samples page (`samples_html.py`)."""
