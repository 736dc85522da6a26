"""Dataset preprocessors to verl parquet and the embedded arithmetic dataset."""
