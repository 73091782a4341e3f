"""ctpore's version: a leaf module (it imports nothing), so that any module can say which version
wrote a file without importing the package root (whose lazy attributes import the pipelines back)."""

__version__ = "0.1.0"
