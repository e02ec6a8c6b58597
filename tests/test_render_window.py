"""The one window module shared by the viewer, play and ``render_mode="human"``."""

from __future__ import annotations

import pygame
import pytest

from llm_gym.render.theme import COLORS
from llm_gym.render.window import BAR_H, MIN_SIZE, blit_fitted, run_window, screen_frame


class CountingApp:
    """A minimal app: quits on Esc, counts ticks; ``bump()`` makes a visible change."""

    def __init__(self):
        self.running, self.version, self.keys, self.ticks = True, 0, [], 0

    def handle_event(self, event):
        if event.type == pygame.KEYDOWN:
            self.keys.append(event.key)
            if event.key == pygame.K_ESCAPE:
                self.running = False
            else:
                self.version += 1

    def tick(self, dt):
        assert dt >= 0
        self.ticks += 1


def test_run_window_redraws_only_on_change_and_closes_the_display():
    app, drawn = CountingApp(), []

    def draw(a, size):
        drawn.append(a.version)
        return screen_frame(size, "title", "help")

    run_window(app, draw, size=(420, 260), title="t", max_frames=4)
    assert app.running and app.ticks == 4 and drawn == [0]  # nothing changed after the first frame
    assert not pygame.display.get_init()
    pygame.display.init()
    for key in (pygame.K_a, pygame.K_ESCAPE):
        pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=key, mod=0, unicode="", scancode=0))
    run_window(app, draw, size=(420, 260), title="t", max_frames=50)
    assert not app.running and app.keys == [pygame.K_a, pygame.K_ESCAPE] and drawn == [0, 1]
    assert not pygame.display.get_init()


def test_run_window_closes_the_display_when_drawing_fails():
    def draw(a, size):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_window(CountingApp(), draw, size=(420, 260), title="t", max_frames=3)
    assert not pygame.display.get_init()


def test_screen_frame_bars_and_minimum_size():
    surf = screen_frame((500, 300), "top", "keys")
    assert surf.get_size() == (500, 300)
    assert tuple(surf.get_at((499, 1)))[:3] == COLORS["title_bar"]
    assert tuple(surf.get_at((499, 300 - BAR_H + 1)))[:3] == COLORS["panel_edge"]
    assert tuple(surf.get_at((250, 150)))[:3] == COLORS["background"]
    with pytest.raises(ValueError, match="too small"):
        screen_frame((MIN_SIZE[0] - 1, MIN_SIZE[1]), "t", "h")


def test_blit_fitted_scales_down_and_centres_but_never_up():
    big = pygame.Surface((200, 100))
    big.fill((255, 0, 0))
    dst = pygame.Surface((120, 120))
    dst.fill((0, 0, 0))
    blit_fitted(dst, big, (10, 10, 100, 100))  # scaled to 100x50, centred vertically: rows 35..84
    assert tuple(dst.get_at((60, 60)))[:3] == (255, 0, 0)
    assert tuple(dst.get_at((60, 30)))[:3] == (0, 0, 0) and tuple(dst.get_at((5, 60)))[:3] == (0, 0, 0)
    small = pygame.Surface((10, 10))
    small.fill((0, 255, 0))
    dst.fill((0, 0, 0))
    blit_fitted(dst, small, (0, 0, 120, 120))  # kept at 10x10 in the middle
    assert tuple(dst.get_at((60, 60)))[:3] == (0, 255, 0) and tuple(dst.get_at((50, 50)))[:3] == (0, 0, 0)
