"""The napari plugin: open scans, reconstruct their pores, and look inside PoreFormer's heads.

``napari.yaml`` is the npe2 manifest (entry point ``napari.manifest``). ``io`` holds the reader,
the writers and the sample data; ``layers`` the work behind the widgets, as plain functions that
need no viewer (tested without one); ``widgets`` the two dock widgets (Qt). Nothing here imports
napari or Qt until napari asks for a contribution.
"""
