"""The frontend's HTTP handlers, a module per resource; each class is given what it
uses (frontend/app.py builds them and holds the routes table)."""
