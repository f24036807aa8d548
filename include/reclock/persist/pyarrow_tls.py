"""pyiceberg's PyArrow FileIO for an S3 endpoint whose certificate a CA of its own signed.

pyiceberg 0.12 passes no CA bundle to pyarrow's ``S3FileSystem``; this FileIO (``py-io-impl``, set by
``reclock.persist.objectstore.pyiceberg_options`` when the settings name a CA bundle) makes the same file
system with ``tls_ca_file_path`` set to the property :data:`CA_BUNDLE`.
"""

from __future__ import annotations

from pyiceberg.io.pyarrow import PyArrowFileIO

CA_BUNDLE = "reclock.s3.ca-bundle"


class CaBundleFileIO(PyArrowFileIO):
    """:class:`PyArrowFileIO` whose S3 file systems trust the CAs in the file :data:`CA_BUNDLE` names."""

    def _initialize_s3_fs(self, netloc):  # noqa: ANN001 - pyiceberg's signature
        fs = super()._initialize_s3_fs(netloc)
        ca = self.properties.get(CA_BUNDLE)
        if not ca:
            return fs
        rebuild, (options,) = fs.__reduce__()  # every option pyiceberg set, as pickling keeps them
        return rebuild({**options, "tls_ca_file_path": ca})
