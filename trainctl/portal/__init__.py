"""The teams' portal: the backend API and web page (app.py create_app), run in the cluster behind the ALB or by ``trainctl ui``."""
