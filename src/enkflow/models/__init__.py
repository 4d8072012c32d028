"""Bundled demo and benchmark models. Each model lives in its own module(s);
import them directly (``enkflow.models.synthetic_land``) so that importing the
package stays cheap."""
