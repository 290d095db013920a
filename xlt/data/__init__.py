"""Problem sets ("languages") and input pipelines."""
