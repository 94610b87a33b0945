"""Small utilities below everything else (they import only ``specdec.errors``): files a user
names (textfiles), JSON with a nesting bound (jsonbound), NaN -> null (jsonable), outside text
made safe to print (printable), API keys and redaction (credentials), the shared bounds of
settings (bounds), machine facts (machine), stopwatch sections (timing)."""
