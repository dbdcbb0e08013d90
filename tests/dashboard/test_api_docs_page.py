"""The API's interactive docs (``/api/v1/docs``) render in a browser that can reach no other host."""

from __future__ import annotations

from urllib.parse import urlparse

API = "/api/v1"


def test_the_api_docs_render_every_route_without_internet(page, local_service):
    elsewhere: list[str] = []

    def only_the_service(route):
        if urlparse(route.request.url).netloc == urlparse(local_service.url).netloc:
            route.continue_()
        else:  # what a machine without internet gets (FastAPI's own page asked cdn.jsdelivr.net)
            elsewhere.append(route.request.url)
            route.abort("internetdisconnected")

    page.route("**/*", only_the_service)
    page.goto(f"{local_service.url}{API}/docs")
    page.locator(".opblock").first.wait_for()
    spec = page.request.get(f"{local_service.url}{API}/openapi.json").json()
    operations = sum(len(methods) for methods in spec["paths"].values())
    assert page.locator(".opblock").count() == operations
    assert page.locator(".title").first.inner_text().startswith(spec["info"]["title"])
    assert page.locator("button.authorize").is_visible()  # the bearer scheme: "Try it out" can send a key
    assert elsewhere == []
