from channels.generic.websocket import AsyncJsonWebsocketConsumer


class RunConsumer(AsyncJsonWebsocketConsumer):
    pass
